"""The simulator of ``streamtopo simulate``: scenario files and synthetic workloads driven through the
same adaptation decision the operator and the local runner make."""
