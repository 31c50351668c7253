"""The study kit: the measurements behind BENCHMARKS.md, beside the product (``dsparkcli``), not in it.

GPU and CPU study scripts, the renderers of BENCHMARKS.md's generated sections, the modules only they use
(``kernel_profile``, ``overhead``, ``replay``) and the committed records (``results/``). Each script runs from
the repo root as ``python -m study.<name>`` and imports its neighbours as ``study.<name>``. The kit uses
dsparkcli only through the seam that docs/DESIGN.md lists and tests/test_layout.py enforces; dsparkcli imports
nothing from here. This file imports nothing: ``gpu_sweep --phase hbm`` runs on a python without dspark's
dependencies.
"""
