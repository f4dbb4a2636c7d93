# Prepared in session 12 (CPU-tested through the interpreter only, not yet timed): after
#   git apply experiments/results/h100x1-s12/next_variants.diff
# an interleaved A/B of three pipelined-loop variants in the spirit of session 12's input-gradient
# change: the attention backward's QKV projection reading x normalised in K chunks (PROJECT_CHUNKS,
# with BACKWARD_STAGES), the MLP forward's attn @ wo in K chunks (OUTPROJ_CHUNKS), and the heads
# backward looping over HEADS_GROUP row blocks a program (fewer partial sums).
python3 experiments/gpu/variants.py base \
  "pk2:fused_attention.PROJECT_CHUNKS=2;fused_attention.BACKWARD_STAGES=2" \
  "pk4:fused_attention.PROJECT_CHUNKS=4;fused_attention.BACKWARD_STAGES=2" \
  "op2:fused_mlp.OUTPROJ_CHUNKS=2" "op4:fused_mlp.OUTPROJ_CHUNKS=4" \
  "hg8:fused_heads.HEADS_GROUP=8" "hg32:fused_heads.HEADS_GROUP=32" \
  --rounds 2 2>&1 | tee $OUT/next_ab.txt
