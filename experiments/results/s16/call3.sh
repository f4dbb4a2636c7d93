# Session 16, call 3 (asked for as nvidia-h200): the softmax's exp2 as ex2.approx.f16x2 (the
# working tree) against 8ee1030 (ab_old/), each side in its own process, alternated three times;
# the approximations' errors again through pallas_util.ptx_approx; AD training on the GPU, XLA
# against the kernels, 1000 updates (experiments/gpu/ad80_check.sh).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card3.txt
python3 experiments/results/s16/check_half2.py 2>&1 | grep -E "approx|Error|error:" | tee $OUT/check_half2_final.txt
timeout 330 bash experiments/gpu/ab_processes.sh 3 --transformer-step --d-model 128 --n-layers 4 --n-heads 4 \
  --context-len 80 --batch 4096 --precisions bf16 --attention pallas --mlp pallas --repeats 10 | tee $OUT/exp2_own.txt
N=1000 timeout 240 bash experiments/gpu/ad80_check.sh
