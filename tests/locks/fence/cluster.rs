//! `FencedKey` on a 3-shard Redis Cluster: the resource, its fence and its write
//! record share one slot, with and without a hash tag of their own.

use std::time::Duration;

use lockflight::RedisBackend;
use lockflight::fence::{Fenced, FencedKey, WriteId};
use testkit::cluster::Cluster;
use testkit::unique_prefix;

use super::{locker, stale};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_on_a_cluster_refuse_an_older_holder() {
    let cluster = Cluster::start();
    cluster.wait_ok(Duration::from_secs(30)).await;
    let prefix = unique_prefix("fence-cluster");
    let backend = RedisBackend::cluster(cluster.urls())
        .prefix(&prefix)
        .connect()
        .await
        .expect("connect to the cluster");
    let locker = locker(backend);
    let mut data = redis::cluster::ClusterClientBuilder::new(cluster.urls())
        .response_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    for name in ["stock:7", "stock:{7}:qty", "a{b"] {
        let key = FencedKey::new(format!("{prefix}:{name}")).unwrap();
        let resource_slot = Cluster::slot(key.name());
        assert_eq!(resource_slot, Cluster::slot(key.fence_name()), "{name}");
        assert_eq!(resource_slot, Cluster::slot(key.writes_name()), "{name}");
        let first = locker.lock(name).await.unwrap();
        let old = first.fencing_token();
        assert_eq!(
            key.incr_by(&mut data, &first, 2).await.unwrap(),
            Fenced::Applied(2)
        );
        first.release().await.unwrap();
        let second = locker.lock(name).await.unwrap();
        assert_eq!(
            key.incr_by(&mut data, &second, 3).await.unwrap(),
            Fenced::Applied(5)
        );
        assert_eq!(
            key.incr_by(&mut data, old, 100).await.unwrap(),
            stale(old, second.fencing_token()).map(|()| 0)
        );
        // A write with an id, repeated: applied once, answered the same.
        let once = WriteId::next();
        for _ in 0..2 {
            assert_eq!(
                key.incr_by_once(&mut data, &second, 10, once)
                    .await
                    .unwrap(),
                Fenced::Applied(15)
            );
        }
        second.release().await.unwrap();
    }
}
