"""Today's methods and the earlier papers' mechanisms, kept for comparison with gedp.

Log-Laplace, Smooth Laplace, Smooth Gamma, truncated Laplace and input noise infusion
(``earlier``), employer-employee privacy on job frames (``erer``) and cell suppression
(``suppression``). They serve the experiments; the release path never imports them.
"""
