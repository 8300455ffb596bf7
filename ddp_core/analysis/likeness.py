"""What emulated nodes match of the real cluster whose compute-to-communication ratio their links borrow.

The first page shows it beside the headline, so that no emulated result stands under a GPU's name without that GPU's
own forecast.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ddp_core.analysis.emulated import BASELINE, link_experiments, similarity_table
from ddp_core.analysis.results import Experiment, wind_tunnel_record
from ddp_core.engine.wind_tunnel_file import ModelledVariant
from ddp_core.analysis.similarity import CONFIGURATIONS, PRESET, large_model
from ddp_core.analysis.tables import median_range, noise_format
from ddp_core.engine.model_cost import bucket_sizes


def fixed_allreduce_ms(record: dict[str, ModelledVariant], variant: str, nodes: int) -> float:
    """A step's all-reduce time that no link rate takes away, such as latency and copies, on this machine.

    It is the wind tunnel's estimate for the rate it accepted, from `wind_tunnel_record`.
    """
    return record[variant].by_nodes[nodes].tries[-1].fixed_s * 1e3


def cluster_fixed_ms(models: str, workload: dict, nodes: int) -> float:
    """The same for the real cluster, from its published latency alpha."""
    # every bucket's ring costs 2(N-1) alpha
    buckets = len(bucket_sizes(large_model(workload)))
    return buckets * 2 * (nodes - 1) * CONFIGURATIONS[models].latency_s(nodes) * 1e3


def likeness_table(study: dict[str, Experiment]) -> pd.DataFrame:
    """The emulated nodes beside the cluster whose ratio they borrow, for the fastest and slowest links at most nodes.

    Each side is a row named in words. NaN marks what is not known for that side.
    """
    # Columns: model preset, global batch, R_N^bench (reached, or the cluster's target), R_N and exposed share f in the
    # runs, the fixed all-reduce time, and the speedup over one (measured with the repeats' range, or forecast).
    record = wind_tunnel_record(study[BASELINE].folder.parent)
    links = list(link_experiments(study))
    points = similarity_table(study).query("variant in @links").set_index(["variant", "nodes"])
    most = int(points.index.get_level_values("nodes").max())
    one = study[BASELINE].baseline
    rows = []
    for variant in dict.fromkeys([links[0], links[-1]]):
        point = points.loc[(variant, most)]
        modelled = bool(point["borrowed"])
        rows.append(
            dict(
                name=f"{most} emulated nodes, {point['setting']}",
                model=one.config["preset"],
                global_batch=one.global_batch_size,
                bench_ratio=point["achieved_ratio"],
                runs_ratio=point["runs_ratio"],
                exposed_share=point["exposed_share"],
                fixed_ms=fixed_allreduce_ms(record, variant, most) if modelled else np.nan,
                speedup=median_range(
                    point["speedup"],
                    point["speedup_low"],
                    point["speedup_high"],
                    noise_format(point["speedup"], point["floor"]),
                    " to ",
                )
                + ", measured",
            )
        )
        if modelled:  # the wind tunnel set these links: add the cluster they borrow from
            rows.append(
                dict(
                    name=f"{most} {point['borrowed']}",
                    model=PRESET,
                    global_batch=point["modelled_batch"],
                    bench_ratio=point["target_ratio"],
                    runs_ratio=np.nan,
                    exposed_share=np.nan,
                    fixed_ms=cluster_fixed_ms(record[variant].models, one.model, most),
                    speedup=f"{point['cluster_low']:.2f} to {point['cluster_high']:.2f}, forecast",
                )
            )
    return pd.DataFrame(rows).set_index("name")
