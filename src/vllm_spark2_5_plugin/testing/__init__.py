"""Tools shared by the tests, the demo and the benchmarks: tiny checkpoints and a
``vllm serve`` launcher. Importing this package needs torch and transformers;
the carrier's entry point never imports it."""
