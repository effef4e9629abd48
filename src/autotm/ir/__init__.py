"""The data the stages pass on: TrainingGraph (graph), Plan (plan), CostModel (costmodel),
budgets (budget). numpy only: importing it loads no torch."""
