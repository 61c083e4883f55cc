"""specctl's SGLang plugin and the contract it shares with the daemon and the simulator.

Importing this package never imports SGLang: the simulator and the daemon use the contract
on machines without SGLang, and the plugin module imports SGLang lazily when it registers.
"""
