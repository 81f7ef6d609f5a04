"""``python -m hetero_harness``: the main job (``main_job.py``), which ``scripts/run.sh`` runs."""

from hetero_harness.main_job import main

if __name__ == "__main__":
    main()
