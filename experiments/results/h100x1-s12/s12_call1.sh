# Session 12, call 1: the MLP rows kernel fed by dh written by the weight-gradient kernel.
set -x
python3 experiments/gpu/variants.py base "rdh:fused_mlp.finish_block=partial(rows_from_dh=True)" \
  "rdh_dbo:fused_mlp.finish_block=partial(rows_from_dh=True);fused_mlp.ROWS_DBO=True" \
  "rdh_c128:fused_mlp.finish_block=partial(rows_from_dh=True);fused_mlp.DH_CHUNK=128" \
  "rdh_s3:fused_mlp.finish_block=partial(rows_from_dh=True);fused_mlp.DH_STAGES=3" \
  "rdh_w8:fused_mlp.finish_block=partial(rows_from_dh=True);fused_mlp.DH_WARPS=8" \
  --rounds 2 2>&1 | tee $OUT/rdh_ab.txt
python3 - <<'PY' 2>&1 | tail -5
import functools, sys
from jaxrl_mgpu.nets import fused_mlp
fused_mlp.finish_block = functools.partial(fused_mlp.finish_block, rows_from_dh=True)
from jaxrl_mgpu import bench
sys.exit(bench.main("--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --batch 4096 "
                    "--precisions bf16 --attention pallas --mlp pallas --repeats 5 --profile /tmp/prof".split()))
PY
python3 experiments/gpu/trace_summary.py /tmp/prof 2>&1 | head -30 | tee $OUT/trace_rdh.txt
