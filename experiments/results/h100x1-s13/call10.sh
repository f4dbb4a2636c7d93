# Session 13, call 10 (base: main at 88c2048): the MLP rows kernel and the attention
# input-gradient kernel issuing their loads of r / dy and x / dres before their pipelined loops
# (so they are in flight during it) instead of after.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base "erows:fused_mlp.EARLY_LOADS=True" \
  "einput:fused_attention.INPUT_EARLY_LOADS=True" \
  "eboth:fused_mlp.EARLY_LOADS=True;fused_attention.INPUT_EARLY_LOADS=True" \
  --rounds 2 2>&1 | tee $OUT/early_ab.txt
