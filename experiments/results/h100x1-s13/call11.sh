# Session 13, call 11 (base: main at ea3ba79): wider tiles with 8 warps (two warpgroups of 64
# rows each), not tried together before: the MLP weight-gradient kernel at 128 rows a step, and
# the MLP forward / rows kernels at 128 rows a program.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base \
  "w128x8:fused_mlp.finish_block=partial(weights_block_rows=128, weights_num_warps=8)" \
  "w128x8rg16:fused_mlp.finish_block=partial(weights_block_rows=128, weights_num_warps=8, row_groups=16)" \
  "r128x8:fused_mlp.finish_block=partial(block_rows=128, num_warps=8)" \
  --rounds 2 2>&1 | tee $OUT/wide_ab.txt
