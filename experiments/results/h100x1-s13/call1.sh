# Session 13, call 1: session 12's prepared pipelined-loop variants (next_variants.diff applied),
# interleaved in one process, then a trace of the base step.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
python3 experiments/gpu/variants.py base \
  "pk2:fused_attention.PROJECT_CHUNKS=2;fused_attention.BACKWARD_STAGES=2" \
  "pk4:fused_attention.PROJECT_CHUNKS=4;fused_attention.BACKWARD_STAGES=2" \
  "op2:fused_mlp.OUTPROJ_CHUNKS=2" "op4:fused_mlp.OUTPROJ_CHUNKS=4" \
  "hg8:fused_heads.HEADS_GROUP=8" "hg32:fused_heads.HEADS_GROUP=32" \
  --rounds 2 2>&1 | tee $OUT/next_ab.txt
python3 -m jaxrl_mgpu.bench --transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 \
  --batch 4096 --precisions bf16 --attention pallas --mlp pallas --repeats 5 --profile /tmp/prof 2>&1 | tail -3
python3 experiments/gpu/trace_summary.py --all /tmp/prof 2>&1 | head -60 | tee $OUT/trace_base.txt
