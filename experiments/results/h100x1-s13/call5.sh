# Session 13, call 5: the MLP weight-gradient kernel's row groups against the H100's / H200's
# 132 SMs (32 groups x 8 hidden chunks = 256 programs; 33 -> 264 = 2 x 132), on top of
# BACKWARD_SEQS=2.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base \
  "rg33:fused_mlp.finish_block=partial(row_groups=33)" "rg66:fused_mlp.finish_block=partial(row_groups=66)" \
  "rg30:fused_mlp.finish_block=partial(row_groups=30)" "rg40:fused_mlp.finish_block=partial(row_groups=40)" \
  "rg49:fused_mlp.finish_block=partial(row_groups=49)" \
  --rounds 2 2>&1 | tee $OUT/rg_ab.txt
