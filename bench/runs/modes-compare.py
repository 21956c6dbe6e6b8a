# Compares the default against the best explicit mode in two `feplb report --modes --json` files:
# per file the workloads meeting the target and the geometric mean of the default's GEMM straggler
# + exposed time over the best mode's; then each workload where the two differ by more than 0.5%.
# usage: python3 bench/runs/modes-compare.py A.json B.json
import json,math,sys
def load(f):
  d=json.load(open(f)); out=[]
  for w in d['workloads']:
    c={x['label']:x for x in w['cells']}
    f_=c['feplb']; b=c[w['best_mode']]
    fv=f_['gemm_straggler_ms']+f_['exposed_ms']; bv=b['gemm_straggler_ms']+b['exposed_ms']
    out.append((w['section'],w['workload'],w['ranks'],fv,bv,f_['token_straggler_reduction'],w['target_met'],f_['planner_us_median']))
  return out
A=load(sys.argv[1]); B=load(sys.argv[2])
for f,r in (('A',A),('B',B)):
  print(f,'met',sum(x[6] for x in r),'geomean', round(math.exp(sum(math.log(x[3]/x[4]) for x in r)/len(r)),4),
        'at or below the best mode', sum(x[3] <= x[4] for x in r))
for i,(a,b) in enumerate(zip(A,B)):
  if abs(a[3]-b[3])>0.0005*max(a[3],1e-9)*10 or a[6]!=b[6] or abs(a[5]-b[5])>0.002:
    print('%2d %-10s %-55s EP=%-3d A %.4f (%.3f) %s  B %.4f (%.3f) %s  best %.4f  plannerus %.1f->%.1f'%(i+1,a[0],a[1][:55],a[2],a[3],a[5],'met' if a[6] else 'MISS',b[3],b[5],'met' if b[6] else 'MISS',b[4],a[7],b[7]))
