# Session 16, call 2 (asked for as nvidia-h200): the softmax's exp2 as packed fp16 again, and
# with P kept in fp16 for the P V and P^T dO matmuls (V and dO cast to fp16 instead); timing
# probes (wrong results, timing only) of the attention kernels' elementwise work: no LayerNorm in
# the forward kernel, no causal mask, no rotary embedding.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card2.txt
timeout 540 python3 experiments/gpu/variants.py base "exp2_f16x2:fused_attention.EXP2='f16x2'" \
  "exp2_f16p:fused_attention.EXP2='f16p'" "noln:fused_attention.PROBE='noln'" \
  "nomask:fused_attention.PROBE='nomask'" "norope:fused_attention.PROBE='norope'" --rounds 3 2>&1 \
  | grep -E "round|ceiling|Error|error" | tee $OUT/attn_probes_ab.txt
