"""How far a capacity estimate can be trusted: agreement with a ground truth and
repeatability over repeated runs (the statistics the Vanguard paper reports)."""
