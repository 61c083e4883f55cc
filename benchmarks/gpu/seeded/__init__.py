"""A seeded Llama target that is predictable by construction, and an EAGLE-3 head trained on it.

`python -m benchmarks.gpu.seeded.build --out DIR` writes DIR/target, DIR/draft, two prompt
families as `specctl bench --dataset` files and DIR/build.json; docs/gpu-models.md explains
the construction and how to serve it.
"""
