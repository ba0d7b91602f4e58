"""Measuring servers on this machine: streamed TTFT/TPOT samples, the hardware fingerprint a
figure was taken on, free and open ports, and waiting until a server answers.

It stands below ``bench`` (the benchmarks), ``tuning`` (the tuner), ``engine`` and ``local``
(the processes they start), so that none of those needs another for its measurements.
"""
