# Session 12, call 3: the attention input-gradient kernel with its three dqkv parts as a
# pipelined loop (INPUT_LOOP, INPUT_STAGES), other warps / rows; the dh-fed MLP rows kernel again.
python3 experiments/gpu/variants.py base "iloop:fused_attention.INPUT_LOOP=True" \
  "iloop_s2:fused_attention.INPUT_LOOP=True;fused_attention.INPUT_STAGES=2" \
  "iloop_s3:fused_attention.INPUT_LOOP=True;fused_attention.INPUT_STAGES=3" \
  "in_w8:fused_attention.attend=partial(warps=(4, 4, 8))" \
  "iloop_s2_w8:fused_attention.INPUT_LOOP=True;fused_attention.INPUT_STAGES=2;fused_attention.attend=partial(warps=(4, 4, 8))" \
  "in_r32:fused_attention.INPUT_ROWS=32" \
  "iloop_s2_r128_w8:fused_attention.INPUT_LOOP=True;fused_attention.INPUT_STAGES=2;fused_attention.INPUT_ROWS=128;fused_attention.attend=partial(warps=(4, 4, 8))" \
  "rdh_c128:fused_mlp.finish_block=partial(rows_from_dh=True);fused_mlp.DH_CHUNK=128" \
  --rounds 2 2>&1 | tee $OUT/input_ab.txt
