"""K/V changed where a CUDA GPU holds them: the set-up in Python and the kernel numba compiles
for the device (the callback launches it: kvinject/engine/callback/device_claims.py)."""
