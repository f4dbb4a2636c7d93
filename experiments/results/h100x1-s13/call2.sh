# Session 13, call 2: attention kernels running several sequences per program as a loop that
# Triton software-pipelines (FORWARD_SEQS / BACKWARD_SEQS, SEQ_STAGES), interleaved A/B.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base \
  "f2:fused_attention.FORWARD_SEQS=2" "f4:fused_attention.FORWARD_SEQS=4" \
  "f2s1:fused_attention.FORWARD_SEQS=2;fused_attention.SEQ_STAGES=1" \
  "b2:fused_attention.BACKWARD_SEQS=2" "b4:fused_attention.BACKWARD_SEQS=4" \
  "b2s3:fused_attention.BACKWARD_SEQS=2;fused_attention.SEQ_STAGES=3" \
  "fb2:fused_attention.FORWARD_SEQS=2;fused_attention.BACKWARD_SEQS=2" \
  --rounds 2 2>&1 | tee $OUT/seqs_ab.txt
