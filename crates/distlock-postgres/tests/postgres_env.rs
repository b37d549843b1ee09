//! The password from the environment (`PGPASSWORD`, `PGPASSFILE`), alone in its test binary:
//! it sets process-wide variables, before any runtime thread starts.
#![cfg(feature = "tls")]

mod support;

use distlock_core::{ClientOptions, Error};
use distlock_postgres::{PostgresBackend, PASSFILE_ENV, PASSWORD_ENV};
use std::os::unix::fs::PermissionsExt;
use support::tls_server;

#[test]
fn password_from_the_environment() {
    let server = tls_server();
    let u = format!(
        "postgres://{}@127.0.0.1:{}/{}?sslmode=require",
        server.user(),
        server.port(),
        server.database()
    );
    let with_password = format!(
        "postgres://{}:{}@127.0.0.1:{}/{}?sslmode=require",
        server.user(),
        server.password(),
        server.port(),
        server.database()
    );
    let dir = std::env::temp_dir().join(format!("dlock-pgenv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pgpass");
    std::fs::write(
        &file,
        format!("*:*:*:{}:{}\n", server.user(), server.password()),
    )
    .expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let connect = |url: &str| rt.block_on(PostgresBackend::connect(url, &ClientOptions::default()));
    // Set while no runtime task runs: nothing reads the environment concurrently.
    std::env::set_var(PASSWORD_ENV, server.password());
    connect(&u).expect("PGPASSWORD");
    // The URL's password comes first: a wrong one fails even with PGPASSWORD right.
    std::env::set_var(PASSWORD_ENV, "wrong-from-env");
    connect(&with_password).expect("the URL's password comes first");
    let e = connect(&u).err().expect("wrong PGPASSWORD");
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(!format!("{e} {e:?}").contains("wrong-from-env"), "{e:?}");
    std::env::remove_var(PASSWORD_ENV);
    std::env::set_var(PASSFILE_ENV, &file);
    connect(&u).expect("PGPASSFILE");
    std::env::set_var(PASSFILE_ENV, dir.join("missing"));
    let e = connect(&u).err().expect("missing PGPASSFILE");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    std::env::remove_var(PASSFILE_ENV);
    std::fs::remove_dir_all(&dir).expect("clean up");
}
