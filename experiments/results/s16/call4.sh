# Session 16, call 4 (asked for as nvidia-h200): the MLP forward kernel writing the next block's
# LayerNorm 1 of its output, which that block's attention forward kernel reads instead of
# normalising x once a head (the working tree), against c75746e (ab_old/), each side in its own
# process, alternated three times; AD training on the GPU with it, XLA against the kernels.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card4.txt
timeout 330 bash experiments/gpu/ab_processes.sh 3 --transformer-step --d-model 128 --n-layers 4 --n-heads 4 \
  --context-len 80 --batch 4096 --precisions bf16 --attention pallas --mlp pallas --repeats 10 | tee $OUT/xnorm_own.txt
N=1000 timeout 240 bash experiments/gpu/ad80_check.sh
mv $OUT/ad80_train.txt $OUT/xnorm_ad80_train.txt
