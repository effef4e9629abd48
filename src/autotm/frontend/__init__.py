"""The front end: one training iteration of a PyTorch model captured as a TrainingGraph
(capture), the optimizer's update lowered to kernels (optim_lowering), the zoo's workloads
captured (workloads)."""
