"""Names of the confidential attributes that postprocessing models treat apart (shared by the month
and wage models, which import these names and not each other)."""

#: The months of a quarter's employment, in order: smoothed across each other, and the wage model's
#: protected employment.
MONTHS = ("m1emp", "m2emp", "m3emp")
#: Total quarterly wages: informed by protected employment.
WAGE = "wage"
#: The name the wage model is recorded under in a release's manifest (solver.wage.model): the margins
#: of wages fitted with it follow ``postprocess.wages``.
WAGE_PRIOR = "wage prior"
