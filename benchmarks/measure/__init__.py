"""The measuring library of the benchmarks: what the benchmark programs in `benchmarks/`
share and never run as an experiment of their own — the UNet job in a private network
namespace and its loopback byte counters (netns), two hosts on a `tc`-capped link
(slow_network), the methods compared and their job configs (methods), the workloads timed
to accuracy (workloads), the analytic byte model (analytic), bytes on the wire per method
(wire), alternating-block timing and pair statistics (alternating_blocks, overhead_pairs)
and TF profiler op times (op_profile). Its modules import each other and nothing of the
benchmark programs; a program imports them as `from measure import netns` (running
`python benchmarks/<program>.py` puts `benchmarks/` on sys.path).
"""
