# Session 13, call 7 (base: BACKWARD_SEQS=2 and the embedding's bias in its matmul): the MLP
# weight-gradient kernel split in two (dh, dw1, db1 / dw2: one fp32 accumulator each, so more
# programs an SM), with more row groups; the attention backward on 32-row blocks or 2 warps.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base "split:fused_mlp.WEIGHTS_SPLIT=True" \
  "split48:fused_mlp.WEIGHTS_SPLIT=True;fused_mlp.finish_block=partial(row_groups=48)" \
  "split64:fused_mlp.WEIGHTS_SPLIT=True;fused_mlp.finish_block=partial(row_groups=64)" \
  "mb32:fused_attention.attend=partial(max_block=32)" "bw2:fused_attention.WARPS=(4, 2, 4)" \
  --rounds 2 2>&1 | tee $OUT/split_ab.txt
