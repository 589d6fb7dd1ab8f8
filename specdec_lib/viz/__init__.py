"""Figures and explorers for the workbook, one module per subject; nothing here decodes.

Every figure function takes results (a table, a `DraftTree`, a mask, per-step records, a data frame) and returns
a plotly `go.Figure`; explorers return an ipywidgets box with `.update()`/`.run()` and `.state`; nothing calls
`show()`. Notebooks compute with the library, then draw with these. plotly and ipywidgets are imported in this
package only, so the rest of `specdec_lib` imports without them.

- `common`: what the modules share: `token_text`, the colour code, `need_columns`, `render` (explorer redraw);
- `tables`: n-gram tables, leaders and followers in recency order (01);
- `trees`: draft trees by depth and breadth, the accepted path, the budget explorer;
- `masks`: attention masks as heatmaps;
- `caches`: a chain method's two KV caches step by step, the rollback explorer (03);
- `acceptance`: what the target accepted per step and per token, the output distribution, acceptance by draft
  depth and against temperature;
- `costs`: forward costs, expected speedups and tokens per step, what a batch achieves;
- `fumble`: FAFO's guess streams over steps and its pool (07);
- `layout`: FAFO's KV layout: block maps, the store's slots over steps, the per-step timing chart (08);
- `timeline`: drafter and target busy intervals as a Gantt chart, and CARD's explorer (09);
- `compare`: every method side by side: per-category radar, efficiency against the bound, why (no) speedup
  from the step records, what the budgets chose (12);
- `bench`: benchmarks and ablations (speed against context, parameter sweeps, heatmaps, the ablation explorer).

The public functions are re-exported here: `from specdec_lib import viz; viz.tree_figure(...)`.
"""
from .common import token_text
from .tables import table_explorer, table_figure
from .trees import budget_explorer, tree_explorer, tree_figure, tree_layout
from .masks import mask_figure, mask_labels
from .caches import CacheStep, cache_steps, cache_timeline_figure, rollback_explorer
from .acceptance import (acceptance_figure, acceptance_html, depth_acceptance_figure, distribution_figure,
                         draft_time_figure, result_acceptance_html, steps_figure, temperature_acceptance_figure,
                         token_kinds)
from .costs import (batch_roofline_figure, cost_curve_figure, cost_figure, expected_tokens_figure, speedup_explorer,
                    speedup_surface_figure)
from .layout import block_map_figure, layout_figure, layout_timing_figure, selection_figure
from .fumble import pool_explorer, pool_figure, streams_figure
from .timeline import card_explorer, timeline_figure
from .compare import (budget_figure, cost_per_token_figure, efficiency_figure, never_slower_figure, radar_figure,
                      step_costs_figure, why_explorer)
from .bench import (ablation_explorer, bench_figure, context_figure, gamma_sweep_figure, heatmap_figure, sweep_figure,
                    table1_figure)

__all__ = ["CacheStep", "ablation_explorer", "acceptance_figure", "acceptance_html", "bench_figure", "context_figure",
           "block_map_figure", "budget_explorer", "card_explorer", "cache_steps", "cache_timeline_figure",
           "batch_roofline_figure", "cost_curve_figure", "cost_figure", "expected_tokens_figure",
           "budget_figure", "cost_per_token_figure", "efficiency_figure", "never_slower_figure", "radar_figure",
           "step_costs_figure", "why_explorer",
           "depth_acceptance_figure", "distribution_figure", "draft_time_figure", "gamma_sweep_figure", "heatmap_figure", "layout_figure",
           "layout_timing_figure", "mask_figure", "mask_labels", "pool_explorer", "pool_figure",
           "result_acceptance_html", "rollback_explorer", "selection_figure", "speedup_explorer",
           "speedup_surface_figure", "steps_figure", "streams_figure", "sweep_figure", "table1_figure",
           "temperature_acceptance_figure",
           "table_explorer", "table_figure", "timeline_figure", "token_kinds", "token_text", "tree_explorer",
           "tree_figure", "tree_layout"]

# the course's classic views (issue 55): one step token by token, Lookahead's window, the speedup model against a
# benchmark, a tree's break-even, the speedup toy that needs no kernel
from .acceptance import chain_step_figure  # noqa: E402
from .costs import break_even_figure, speedup_model_figure, speedup_slider_figure  # noqa: E402
from .fumble import lookahead_window_figure  # noqa: E402

__all__ += ["break_even_figure", "chain_step_figure", "lookahead_window_figure", "speedup_model_figure",
            "speedup_slider_figure"]
