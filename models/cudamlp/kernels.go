//go:build tandemcuda

package cudamlp

// kernelSource is the CUDA C of the element-wise passes, compiled by NVRTC
// to PTX for the device's JIT (the default virtual architecture).
const kernelSource = `
extern "C" __global__ void relu_forward(float *y, long long n) {
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n && !(y[i] > 0.0f)) y[i] = 0.0f;
}

// dy is zeroed where the layer's ReLU output y is not positive.
extern "C" __global__ void relu_backward(float *dy, const float *y, long long n) {
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n && !(y[i] > 0.0f)) dy[i] = 0.0f;
}

// One thread a row: loss[r] = (logsumexp(z_r) - z_r[label_r]) / batch and
// dz_r = (softmax(z_r) - onehot(label_r)) / batch, so that the sum of loss
// is the mean cross-entropy and dz its gradient.
extern "C" __global__ void softmax_xent(const float *z, const int *labels, float *dz, float *loss,
                                        long long batch, long long classes) {
	long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (r >= batch) return;
	const float *zr = z + r * classes;
	float *dr = dz + r * classes;
	float m = zr[0];
	for (long long j = 1; j < classes; j++) m = fmaxf(m, zr[j]);
	float s = 0.0f;
	for (long long j = 0; j < classes; j++) s += expf(zr[j] - m);
	int y = labels[r];
	float inv = 1.0f / (float)batch;
	for (long long j = 0; j < classes; j++) dr[j] = (expf(zr[j] - m) / s - (j == y ? 1.0f : 0.0f)) * inv;
	loss[r] = (logf(s) + m - zr[y]) * inv;
}
`
