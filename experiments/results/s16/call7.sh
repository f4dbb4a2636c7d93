# Session 16, call 7: the final code (the packed exp2 chosen by the compute dtype, 16-bit only)
# on a GPU: the AD-size kernel row twice and AD training, XLA against the kernels, 1000 updates.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card7.txt
for i in 1 2; do
  timeout 90 python3 -m jaxrl_mgpu.bench --transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 \
    --repeats 10 --batch 4096 --precisions bf16 --attention pallas --mlp pallas 2>&1 | grep -E "^d[0-9]|^bf16 matmul" \
    | tee -a $OUT/final_ad4096.txt
done
N=1000 timeout 240 bash experiments/gpu/ad80_check.sh
mv $OUT/ad80_train.txt $OUT/final_ad80_train.txt
