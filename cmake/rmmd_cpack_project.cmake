# CPack's per-generator settings (CPACK_PROJECT_CONFIG_FILE of
# cmake/rmmd_install.cmake), read by cpack before each generator runs.

if(CPACK_GENERATOR STREQUAL "DEB")
  # Install with DESTDIR and the real prefix, so that the install-time code
  # sees /usr (the unit's paths, /etc for the config).
  set(CPACK_SET_DESTDIR ON)
  set(CPACK_INSTALL_PREFIX /usr)
  set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
  # Each package's description starts with its own summary line
  # (CPACK_DEBIAN_<COMPONENT>_DESCRIPTION); CPack prepends the project's
  # summary unless it is CPack's default.
  set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${CPACK_DEFAULT_PACKAGE_DESCRIPTION_SUMMARY}")
elseif(CPACK_GENERATOR STREQUAL "TGZ")
  # rmmd-VERSION-linux-ARCH/{bin,lib,include,etc,share}: a prefix of its own,
  # unpacked anywhere (everything finds its libraries by $ORIGIN). No systemd
  # unit (RMMD_ARCHIVE): its paths would be where CPack staged the files.
  set(CPACK_SET_DESTDIR OFF)
  set(CPACK_PACKAGING_INSTALL_PREFIX /)
  set(CPACK_PACKAGE_FILE_NAME "${CPACK_RMMD_ARCHIVE_NAME}")
  set(CPACK_CUSTOM_INSTALL_VARIABLES "RMMD_ARCHIVE=ON")
endif()
