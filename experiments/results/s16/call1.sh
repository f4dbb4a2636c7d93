# Session 16, call 1 (asked for as nvidia-h200). On an H200: issue 4's table (s15/call5.sh's
# commands). On an H100: the packed fp16 approximations checked against fp32, then an
# interleaved A/B of the GELU's tanh and the softmax's exp2 as packed fp16 instructions (two
# elements an instruction), with probes that drop the special-function op (wrong results, timing
# only: what those ops cost at most).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card1.txt
if grep -q H200 $OUT/card1.txt; then
  OUT=$OUT bash experiments/results/s15/call5.sh
  exit
fi
python3 experiments/results/s16/check_half2.py 2>&1 | grep -E "approx|Error|error:" | tee $OUT/check_half2.txt
timeout 480 python3 experiments/gpu/variants.py base "tanh_f16x2:fused_mlp.TANH='f16x2'" \
  "exp2_f16x2:fused_attention.EXP2='f16x2'" "both_f16x2:fused_mlp.TANH='f16x2';fused_attention.EXP2='f16x2'" \
  "tanh_none:fused_mlp.TANH='none'" "exp2_none:fused_attention.EXP2='none'" --rounds 2 2>&1 \
  | grep -E "round|ceiling|Error|error" | tee $OUT/half2_ab.txt
