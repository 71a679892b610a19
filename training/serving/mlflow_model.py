"""The MLflow pyfunc model of a seqenc bundle ("models from code": MLflow stores this file with
the model and runs it to load; the weights stay our safetensors + JSON config, nothing is
pickled).

Every training mode's bundle loads and scores here (interleaved / no_interleave TVM-KA and the
end-to-end joint, flattened and record_view models: training.serving.scoring.load_bundle picks the class
the bundle's architecture.json names). Input: long-form objects (a pandas DataFrame with
``sequence_id, step, key, value`` and, for log tasks, ``template_id``); output: one row per
sequence with ``sequence_id, score, prediction, prob_<class>...`` (training.serving.scoring.score_objects,
which builds each model's input as its training did). It serves on the CPU unless the loader
asks for a device: ``mlflow.pyfunc.load_model(uri, model_config={"device": "cuda"})``. Loading needs the seqenc distribution
installed (the model's requirements name it).
"""

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class SeqencModel(PythonModel):
    def load_context(self, context):
        from training.serving.scoring import load_bundle

        # served on the CPU unless the loader asks for a device: model_config={"device": "cuda"}
        config = getattr(context, "model_config", None) or {}
        self.bundle = load_bundle(context.artifacts["bundle"], str(config.get("device", "cpu")))

    # the hint names the type only: MLflow infers no schema from pd.DataFrame (the logged signature
    # is the contract) and stops asking for hints on every `seqenc train`
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        import polars as pl

        from training.serving.scoring import score_objects

        return score_objects(self.bundle, pl.from_pandas(model_input), progress=False).to_pandas()


mlflow.models.set_model(SeqencModel())
