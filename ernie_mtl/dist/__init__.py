"""The process and its place in the job: threads and executor flags chosen before paddle's import,
a quiet console, the launcher's ports, process info and the store barrier, the topology and fleet
strategy, the CPU/gloo shim and GPU-program emulation, and the watchdog. Imports only config."""
