# Runs at install time (from cmake/rmmd_install.cmake's install(CODE)), when
# the real prefix is known: `cmake --install build --prefix P` or /usr under
# CPack (with DESTDIR, which file(INSTALL) adds itself).
#
# - The unit in deploy/ is written for the Debian layout (/usr/bin/rmmd,
#   /etc/rmmd/). Installed under another prefix, its references to our own
#   programs, config directory and docs are rewritten to where they were put,
#   so `systemctl start rmmd` runs what was installed. Nothing else changes.
# - The config: <sysconfdir>/rmmd/rmmd.conf from the example, only where there
#   is none yet (an operator's file is never overwritten; the .deb marks it a
#   conffile, so dpkg does the same across upgrades).
#
# - The portable archive (RMMD_ARCHIVE set, by cmake/rmmd_cpack_project.cmake)
#   gets no unit: where it will be unpacked is not known.
#
# In: RMMD_UNIT_IN, RMMD_SCRATCH_DIR (a directory in the build tree), RMMD_CONF_EXAMPLE (may be empty),
#     RMMD_BINDIR, RMMD_SYSCONFDIR, RMMD_DOCDIR (as configured, usually relative),
#     RMMD_ARCHIVE (optional).

# GNUInstallDirs' rule for the full directories: relative ones are under the
# prefix, except that the prefix /usr keeps its configuration in /etc.
function(_rmmd_full_dir out dir)
  if(IS_ABSOLUTE "${dir}")
    set(full "${dir}")
  elseif(dir STREQUAL "etc" AND CMAKE_INSTALL_PREFIX MATCHES "^/usr/?$")
    set(full "/etc")
  else()
    set(full "${CMAKE_INSTALL_PREFIX}/${dir}")
  endif()
  string(REGEX REPLACE "/+" "/" full "${full}")
  set(${out} "${full}" PARENT_SCOPE)
endfunction()

_rmmd_full_dir(_bindir "${RMMD_BINDIR}")
_rmmd_full_dir(_etcdir "${RMMD_SYSCONFDIR}")
_rmmd_full_dir(_docdir "${RMMD_DOCDIR}")

if(NOT RMMD_ARCHIVE)
  file(READ "${RMMD_UNIT_IN}" _unit)
  string(REGEX REPLACE "/usr/bin/(rmmd|rmmctl)([ \t\n])" "${_bindir}/\\1\\2" _unit "${_unit}")
  string(REPLACE "/etc/rmmd/" "${_etcdir}/rmmd/" _unit "${_unit}")
  string(REPLACE "/usr/share/doc/rmmd/" "${_docdir}/" _unit "${_unit}")
  # One file per destination: a packaging run may install beside another one.
  string(MD5 _dest "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}")
  set(_out "${RMMD_SCRATCH_DIR}/${_dest}/rmmd.service")
  file(WRITE "${_out}" "${_unit}")
  file(INSTALL "${_out}" DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system"
       RENAME rmmd.service PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endif()

if(RMMD_CONF_EXAMPLE)
  if(EXISTS "$ENV{DESTDIR}${_etcdir}/rmmd/rmmd.conf")
    message(STATUS "Keeping: $ENV{DESTDIR}${_etcdir}/rmmd/rmmd.conf (the example is in ${_docdir})")
  else()
    file(INSTALL "${RMMD_CONF_EXAMPLE}" DESTINATION "${_etcdir}/rmmd" RENAME rmmd.conf
         PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  endif()
endif()
