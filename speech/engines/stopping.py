"""An ONNX Runtime session whose runs stop when the synthesis job running them is abandoned.

A model's run is most of a job (Hibari's acoustic model: about 30 of a sentence's 50 ms); without
this, a job whose client hung up in the middle of it ran the model to its end, on a core a newcomer's
first sentence wanted (bench/hangup.py). ONNX Runtime checks a run's `terminate` flag between the
graph's nodes, and the run then fails: speech/engines/jobs.py's `stoppable` turns that into
JobAbandoned.
"""

from __future__ import annotations

from .jobs import stoppable


class StoppableSession:
    """Wraps an `onnxruntime.InferenceSession`: `run` as the session's, stoppable; the rest passes through."""

    def __init__(self, session):
        self._session = session

    def run(self, output_names, input_feed, run_options=None):
        import onnxruntime as ort

        options = run_options or ort.RunOptions()

        def stop():
            options.terminate = True

        with stoppable(stop):
            return self._session.run(output_names, input_feed, options)

    def __getattr__(self, name):
        return getattr(self._session, name)
