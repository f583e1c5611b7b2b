"""The budget planner: a plan (which group-by queries measure employment and wages, and their mu)
chosen from a state's published QCEW file alone, by the errors the least squares' covariance
predicts on a stand-in synthesized from it (``search``, ``predict``, ``shapes``)."""
