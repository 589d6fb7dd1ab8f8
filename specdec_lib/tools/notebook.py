"""What every notebook's first cells need, written once: the versions banner and figure saving.

    from specdec_lib.tools import notebook
    notebook.banner()                          # torch / transformers / specdec_lib versions and the device
    save = notebook.figure_saver(FIGURES_DIR)  # save(fig, "name") -> fig, also written to FIGURES_DIR/name.html

Simplifications: figures are saved as HTML with plotly.js from a CDN (small files; they need internet to open).
"""
from __future__ import annotations

from pathlib import Path


def banner() -> str:
    """Print (and return) the versions and the device, and silence download/loading progress bars."""
    import torch
    import transformers

    import specdec_lib

    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bars in the outputs
    from specdec_lib.models import gpu_name, resolve_device

    found = resolve_device("auto")
    device = gpu_name(found) if found.type == "cuda" else f"CPU only ({torch.get_num_threads()} threads)"
    text = (f"torch {torch.__version__} | transformers {transformers.__version__} | specdec_lib "
            f"{specdec_lib.__version__}\ndevice: {device}")
    print(text)
    return text


def figure_saver(folder):
    """A `save(fig, name)` that writes fig as HTML under `folder` (when set) and returns it for display.

    The HTML loads plotly.js from `folder/plotly.min.js` (written with the first figure): no CDN."""
    def save(fig, name: str):
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            fig.write_html(Path(folder) / f"{name}.html", include_plotlyjs="directory")
        return fig
    return save

