"""A learned cost model: gradient-boosted trees (LightGBM) that predict a config's time on a
problem from the problem's sizes and roofline, the GPU's peak rates, the formulation and the
config's parameters, learned from the measurements autocnn holds (records, replay files, studies).

It ranks configs where no measurement of the problem exists: the lookup's borrowed and default
configs, quick tuning's candidates, the tuner's first trials (``ranking``). ``features``: the
columns; ``model_file``: the file, its format and the model in use; ``training``: measurements and
the fit; ``evaluation``: held-out rank correlations against the nearest-shape rule.
``scripts/train_cost_model.py`` trains the shipped model (``cost_model.json.gz`` beside this file).
"""
