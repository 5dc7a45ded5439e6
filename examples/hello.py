# A small real job: some computation, some output, and a value for the envelope.
import platform
import statistics

samples = [3.1, 2.7, 4.4, 3.9, 2.2, 5.0]
print(f"Python {platform.python_version()} summarising {len(samples)} samples")
{"mean": round(statistics.mean(samples), 3), "stdev": round(statistics.stdev(samples), 3)}
