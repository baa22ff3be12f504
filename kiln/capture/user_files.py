"""Which source files are the user's: code outside the standard library and installed packages."""
import sysconfig

_LIBRARY_DIRS = tuple({p for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                   sysconfig.get_paths()["platlib"]) if p})


def is_user_file(filename):
    return not filename.startswith(_LIBRARY_DIRS) and not filename.startswith("<")
