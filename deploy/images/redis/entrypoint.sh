#!/bin/sh
# As the official redis image: options alone run redis-server; without a config file, listen on
# every interface with protected mode off (the container network is the boundary).
set -e
case "$1" in -*) set -- redis-server "$@" ;; esac
if [ "$1" = "redis-server" ]; then
  case "$2" in
    */*.conf|*.conf) ;;
    *) shift; set -- redis-server --bind "* -::*" --protected-mode no "$@" ;;
  esac
fi
exec "$@"
