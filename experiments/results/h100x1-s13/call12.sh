# Session 13, call 12 (base: main at ea3ba79): around call 11's best, the MLP weight-gradient
# kernel at 128 rows a step with 8 warps: row groups 16 / 12 / 8, and 256 rows a step.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
P="fused_mlp.finish_block=partial(weights_block_rows"
python3 experiments/gpu/variants.py base "rg16:$P=128, weights_num_warps=8, row_groups=16)" \
  "rg12:$P=128, weights_num_warps=8, row_groups=12)" "rg8:$P=128, weights_num_warps=8, row_groups=8)" \
  "w256rg16:$P=256, weights_num_warps=8, row_groups=16)" \
  --rounds 2 2>&1 | tee $OUT/wide2_ab.txt
