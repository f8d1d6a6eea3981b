"""Iteration-time predictor and capacity planner (``dlbooster predict``): the work of a step
(:mod:`.work`), device profiles (:mod:`.profiles`), calibration (:mod:`.calibration`) and the
prediction (:mod:`.model`).

After Pei et al., "Iteration Time Prediction for CNN in Multi-GPU Platform" (IEEE Access
2019): the iteration time of data-parallel CNN training predicted from the model's
per-layer work, a device profile and the network, with the limiting stage named.

- Work (:func:`workload`): the real torchvision model runs one training step (forward,
  cross-entropy, backward, SGD with momentum and weight decay) on PyTorch's ``meta``
  device, which computes shapes but no values, under a dispatch mode that records every
  ATen operator with its tensors. Convolutions and matrix products get their FLOPs
  (``2 * N * Cout * Ho * Wo * Cin / groups * kh * kw``; the backward's input gradient and
  weight gradient, ``convolution_backward``'s output mask, each as much as the forward)
  and their matrix-product dimensions (im2col form), every other operator the bytes it
  reads and writes; views move nothing. Gradient
  readiness (which backward operator completes each parameter's gradient) is recorded
  too, for the communication overlap.
- Device (:class:`Profile`): per-operator cost functions. ``dlbooster predict calibrate``
  measures them on the machine at hand by timing representative kernels (convolutions of
  a seeded random shape grid, not the validated models' layers; memory-bound operators
  at several sizes; all-reduces between local processes); shipped GPU profiles come from
  public peak figures and are marked as such. On the CPU, every tensor of at least 32 MiB
  is a fresh mapping of the C library's (glibc's mmap threshold), page-faulted in as it
  is written: that cost is measured apart (the kernels are timed with freed memory
  kept) and charged per byte of such outputs, which is what makes large batches and
  VGG's classifier gradients slower than their kernels. Calibration ends by training
  :data:`REFERENCE_MODELS` (models no validation uses by default) for a few steps: their
  measured step over their operators' summed prices is the profile's ``step_factor``,
  by which every operator's price is multiplied (the framework's work per operator and
  kernels slowed by their neighbours' data, which kernels timed alone miss).
- Communication: gradients in DistributedDataParallel's buckets (in the order they
  become ready, as DDP rebuilds them after its first iteration; 1 MiB first bucket,
  25 MiB after), each all-reduced by a ring as soon as its last gradient is ready:
  ``2 (p - 1) latency + 2 (p - 1) / p * bytes / bandwidth``, bandwidth the slower of the
  intra-node link and, with several nodes, the network. Communication under the
  backward is hidden as far as the profile's ``overlap`` says. ``split``
  (:class:`dlbooster.train.schedule.SplitBackward`) adds its measured CPU overhead; its GPU
  side streams are not modelled as faster (not yet measured on a GPU).
- Input: the decoder's rate (``LANESxMHZ``: lanes x clock / clocks per image, the lane's
  measured clocks per ImageNet photo, :data:`dlbooster.hw.build.synth.IMAGENET_CLOCKS`) or a CPU
  decode rate per core, and the host runtime's cost per image.

The iteration takes the longest of compute plus exposed communication, decode and host
work; that stage is the bottleneck.
"""
