set -o pipefail
export NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=32
B=$PWD/.devbundle
libdirs=$(python3 -c 'import os,site;print(":".join(os.path.join(d,"nvidia",x,"lib") for d in site.getsitepackages() for x in ("cublas","cu13","nccl","cuda_runtime") if os.path.isdir(os.path.join(d,"nvidia",x,"lib"))))')
export LD_LIBRARY_PATH=$B/lib:$libdirs:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$PWD/python FEPLB_LIBRARY=$B/lib/libfeplb_c.so PYTHONUNBUFFERED=1
python3 -c 'import torch;print(torch.__version__, torch.cuda.device_count())'

echo "== torch tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch.py 2>&1 | tail -40 | tee $OUT/torch_tests.log
echo "== overhead"
timeout 150 python3 bench/gpu/torch_overhead.py --out $OUT/torch-overhead.json --reps 20 2>&1 | tail -40
