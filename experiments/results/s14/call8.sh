# Session 14, call 8: the heads kernels (forward and backward, one program a row block) at other
# row blocks / warps, interleaved.
python3 experiments/gpu/variants.py base \
  "h128w8:fused_heads.heads=partial(block_rows=128, num_warps=8)" \
  "h128w4:fused_heads.heads=partial(block_rows=128, num_warps=4)" \
  "h32w4:fused_heads.heads=partial(block_rows=32, num_warps=4)" \
  --rounds 2 2>&1 | grep -E "ceiling|round" | tee $OUT/heads_blocks_ab.txt
