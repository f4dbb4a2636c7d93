# Session 12, call 4: around the pipelined input-gradient loop (parts split finer, rows per
# program, stages), and with the dh-fed MLP rows kernel.
IL="fused_attention.INPUT_LOOP=True;fused_attention.INPUT_STAGES=2"
RDH="fused_mlp.finish_block=partial(rows_from_dh=True)"
python3 experiments/gpu/variants.py base "il:$IL" "il_split2:$IL;fused_attention.INPUT_SPLIT=2" \
  "il_split2_s3:$IL;fused_attention.INPUT_SPLIT=2;fused_attention.INPUT_STAGES=3" \
  "il_split4_s3:$IL;fused_attention.INPUT_SPLIT=4;fused_attention.INPUT_STAGES=3" \
  "il_r128:$IL;fused_attention.INPUT_ROWS=128" "il_r32:$IL;fused_attention.INPUT_ROWS=32" \
  "il_rdh128:$IL;$RDH;fused_mlp.DH_CHUNK=128" "il_rdh256:$IL;$RDH;fused_mlp.DH_CHUNK=256" \
  --rounds 2 2>&1 | tee $OUT/input2_ab.txt
