"""What is installed and where: the optional packages by feature and extra, and the plugin's
directory and hydra recipes in a clone or an installed package."""
