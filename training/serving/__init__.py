"""What happens to a trained model: bundles and scoring, batch scoring, evaluation, MLflow tracking and registry."""
