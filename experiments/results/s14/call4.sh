# Session 14, call 4: two-warpgroup settings for the kernels that session 13 left at 64 rows /
# 4 warps, interleaved: the attention input-gradient kernel at 128 rows on 8 warps; the MLP
# forward and rows kernels on 8 warps at 64 rows; the forward's hidden chunks 128 wide.
python3 experiments/gpu/variants.py base \
  "in128w8:fused_attention.INPUT_ROWS=128;fused_attention.attend=partial(warps=(4, 4, 8))" \
  "mlp_w8:fused_mlp.finish_block=partial(num_warps=8)" \
  "fwd_bh128:fused_mlp.finish_block=partial(block_hidden=128)" \
  --rounds 2 2>&1 | grep -E "ceiling|round" | tee $OUT/warpgroups_ab.txt
