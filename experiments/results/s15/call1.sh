# Session 15, call 1: the attention kernels taking several heads a program in turn (the
# sequence loaded, and in the forward pass normalised, once for them), interleaved.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base \
  "f2:fused_attention.FORWARD_HEADS=2" \
  "f4:fused_attention.FORWARD_HEADS=4" \
  "b2:fused_attention.BACKWARD_HEADS=2" \
  "b2s1:fused_attention.BACKWARD_HEADS=2;fused_attention.BACKWARD_SEQUENCES=1" \
  "b4s1:fused_attention.BACKWARD_HEADS=4;fused_attention.BACKWARD_SEQUENCES=1" \
  --rounds 2 2>&1 | grep -E "ceiling|round|rror" | tee $OUT/heads_ab.txt
