import json,sys,glob,collections,statistics
d=sys.argv[1]
res=collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(d+'/*.json')):
    v=f.split('/')[-1].rstrip('0123456789.json')
    try: j=json.load(open(f))
    except Exception: continue
    for b in j['benchmarks']:
        if b.get('aggregate_name')=='median':
            name=b['run_name'].replace('/repeats:3','')
            res[name][v].append(b['real_time']/1000 if b['time_unit']=='ns' else b['real_time'])
for n in res:
    r=res[n]
    if 'base' in r and 'new' in r:
        ratios=[a/b for a,b in zip(r['new'],r['base'])]
        print(f"{n:55s} base {' '.join('%.1f'%x for x in r['base'])}  new {' '.join('%.1f'%x for x in r['new'])}  new/base {' '.join('%.2f'%x for x in ratios)}")
