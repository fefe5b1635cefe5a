
/*
 * Copyright (C) The ngx_http_idempotency_module authors
 *
 * The one place the release version is written: the module logs it,
 * build_info exports it, and util/version-check.sh compares CHANGELOG.md
 * and debian/changelog with it.
 */


#ifndef _NGX_HTTP_IDEMPOTENCY_VERSION_H_INCLUDED_
#define _NGX_HTTP_IDEMPOTENCY_VERSION_H_INCLUDED_


#define NGX_HTTP_IDEMPOTENCY_VERSION        "0.4.0"


#endif /* _NGX_HTTP_IDEMPOTENCY_VERSION_H_INCLUDED_ */
