"""What the notebooks run on: notebook helpers (parameters, progress, figures), claims (a measured sentence checked
from the run's numbers), run_notebooks (`make workbook`), offline_views (saved notebooks' figures without a
kernel) and colab (the Colab setup cell).
"""
