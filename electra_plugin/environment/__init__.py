"""What is installed and where: the optional packages by feature and extra, the plugin's
directory and hydra recipes in a clone or an installed package, and whether the device
multiplies bf16 in hardware."""
