"""pt215: the helper package of the book "PyTorch 2.15 in Practice".

The reader's map. What a notebook or a chapter script imports is flat, one module per topic:

- `hardware`: what this machine has, and the gates a cell uses when it needs more (every chapter); `needs`: the
  gates' vocabulary in words, without torch.
- `launch`: run a torchrun-compatible script on N local ranks from a cell; `init_rank`/`shutdown` in scripts
  (every chapter).
- `timing`: the one clock (device sync, stopwatch, timing loops); `bench`: collective busbw the nccl-tests way
  (chapter 1); `links`: the peak of the link a collective crosses (chapter 1).
- `flight`: read, repair and diagnose flight-recorder dumps (chapter 2).
- `transport`: one-sided transfers with `torch.distributed._transport` over NIXL (chapter 3).
- `fsdp`: a small MoE transformer and FSDP2 precision helpers (chapter 4); `memory`: peak and retained bytes from the
  allocator's events, and autograd's saved tensors (chapters 4, 10).
- `nvfp4`: the NVFP4 format from first principles (chapter 5); `roofline`: bytes and FLOPs per decode step and
  the measurements beside them (chapters 5, 6); `attention`: a paged-KV attention reference (chapter 5);
  `inductor_code`: the code Inductor writes for a GPU this machine lacks (chapter 5).
- `model`: the book's small language model with trained weights and its decode loop (chapters 5, 6); `moe`: the
  one mixture-of-experts (chapters 4-6).
- `fp8`: FP8 quantization and scaled matmul (chapter 6); `w8a8`: a whole model in FP8 (chapter 6);
  `mps_kernels`: the Apple-GPU operations the release calls faster (chapter 6).
- `pipeline`: pipeline-parallel memory accounting and lowered schedules (chapter 8).
- `native`: C++ extensions against 2.15: standards, `TORCH_TARGET_VERSION`, headers (chapter 9).
- `figures`: the book's figure style and `show` (a figure with its alt text; `name=` puts it on a chapter page),
  and `diagrams`: mechanisms drawn by code (sequence diagrams, timelines, bit layouts, grids) (every chapter);
  `exercises`: the checking cell of an exercise (every notebook); `widgets`: widgets that compute in the
  browser (every chapter); `evidence`: bind a page's figure to the output that measured it;
  `cpu_kernels`: print a value whose last digits depend on the CPU's kernels; `book_files`: where the chapter
  scripts and shipped data live.
- `ab`: `python -m pt215.ab`, two settings of one torchrun job run interleaved and compared (chapter 11).
- `doctor`: `python -m pt215.doctor`, can this machine follow the book (workshop pre-flight).
- `boundary`: the old spelling of `python -m pt215.verify.boundary`.

Three programs live beside the helpers, each in a subpackage of its own:

- `upgrade/`: the 2.15 upgrade scanner, `python -m pt215.upgrade PATH...`, and the environment checks it shares with
  the doctor (chapter 7).
- `verify/`: the verifier, `python -m pt215.verify`: the catalogue of hardware-gated paths, their checks, the
  record they write, the run to the hardware boundary and the fake-CUDA mechanism.
- `site/`: what only the website's build uses (the Sphinx extension, stamps, workshop tables).
"""

__version__ = "0.1.0"
