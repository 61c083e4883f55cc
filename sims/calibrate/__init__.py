"""Ground the simulator's cost model in measured GPU step times.

`shapes` names the model shapes, `model` builds random-weight bf16 transformer stacks (dense and
MoE targets, an EAGLE-3-shaped draft head) with torch, `bench` times their forwards with CUDA
graphs (or eagerly on the CPU, on tiny shapes), and `fit` turns the measurements into the
`target.*` / `draft.*` fields of a simulator profile. `bench` and `model` need torch; `shapes`
and `fit` do not. docs/simulator.md ("Calibrating the cost model on a GPU") says how to rerun it.
"""
