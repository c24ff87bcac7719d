use super::*;

const MS_5: VirtNanos = VirtNanos(5_000_000);

fn links(from: &[PortId], to: &[PortId], both_ways: bool) -> Links<PortId> {
    Links {
        from: from.to_vec(),
        to: to.to_vec(),
        both_ways,
    }
}

/// One frame over each of the six directed links between A, B and C at
/// `now`, tagged `base + i`.
fn all_links(switch: &mut Switch, now: VirtNanos, base: u32) {
    let pairs = [(A, B), (B, A), (A, C), (C, A), (B, C), (C, B)];
    for (i, (from, to)) in pairs.into_iter().enumerate() {
        switch
            .submit(now, from, frame(mac_of(to), from, base + i as u32))
            .unwrap();
    }
}

/// The (from, to) of each delivered frame of `all_links`, by tag offset.
fn delivered_links(schedule: &[(VirtNanos, PortId, u32)], base: u32) -> Vec<u32> {
    let mut tags: Vec<u32> = schedule
        .iter()
        .map(|&(_, _, t)| t)
        .filter(|t| (base..base + 6).contains(t))
        .map(|t| t - base)
        .collect();
    tags.sort();
    tags
}

/// Frame `i` of `count` over `links[i % len]` at `i` seconds (far apart,
/// so no FIFO clamping), and how long each frame that arrived took.
fn spaced_delays(
    switch: &mut Switch,
    links: &[(PortId, [u8; 6])],
    count: u32,
) -> Vec<(u32, VirtNanos)> {
    let mut delays = Vec::new();
    for i in 0..count {
        let now = VirtNanos::from_secs(u64::from(i));
        let (from, to) = links[i as usize % links.len()];
        switch.submit(now, from, frame(to, from, i)).unwrap();
        if let Some(deadline) = switch.next_deadline() {
            switch.due(deadline);
            delays.push((i, deadline - now));
        }
    }
    delays
}

#[test]
fn test_switch_cut_blocks_both_ways_and_leaves_the_third_port_connected() {
    // Arrange
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    switch
        .schedule_fault(VirtNanos(0), Fault::Block(links(&[A], &[B], true)))
        .unwrap();

    // Act
    all_links(&mut switch, VirtNanos(0), 0);
    let schedule = drain(&mut switch);

    // Assert: A->B (0) and B->A (1) cut; A<->C and B<->C up.
    assert_eq!(delivered_links(&schedule, 0), [2, 3, 4, 5]);
    assert_eq!(switch.blocked_links(), [(A, B), (B, A)]);
    assert_eq!(switch.counters(A).unwrap().dropped_partition, 1);
    assert_eq!(switch.counters(B).unwrap().dropped_partition, 1);
}

#[test]
fn test_switch_one_way_partition_blocks_one_direction_only() {
    // Arrange
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    switch
        .schedule_fault(VirtNanos(0), Fault::Block(links(&[A], &[B, C], false)))
        .unwrap();

    // Act
    all_links(&mut switch, VirtNanos(0), 0);
    let schedule = drain(&mut switch);

    // Assert: A->B (0) and A->C (2) cut; replies to A arrive.
    assert_eq!(delivered_links(&schedule, 0), [1, 3, 4, 5]);
}

#[test]
fn test_switch_blocks_add_up_unblock_is_selective_and_shapes_replace() {
    // Arrange: cut A<->B and A<->C at 1 ms; uncut A<->B at 2 ms; a
    // partition {A,B} | {C} at 3 ms replaces what is left; heal at 4 ms.
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    let ms = |n: u64| VirtNanos(n * 1_000_000);
    switch
        .schedule_fault(ms(1), Fault::Block(links(&[A], &[B], true)))
        .unwrap();
    switch
        .schedule_fault(ms(1), Fault::Block(links(&[A], &[C], true)))
        .unwrap();
    switch
        .schedule_fault(ms(2), Fault::Unblock(links(&[B], &[A], true)))
        .unwrap();
    switch
        .schedule_fault(ms(3), Fault::Partition(vec![vec![A, B], vec![C]]))
        .unwrap();
    switch.heal(ms(4)).unwrap();

    // Act
    let mut phases = Vec::new();
    for (phase, at) in [ms(1), ms(2), ms(3), ms(4)].into_iter().enumerate() {
        let base = 10 * phase as u32;
        all_links(&mut switch, at, base);
        phases.push(delivered_links(&drain(&mut switch), base));
    }

    // Assert
    assert_eq!(
        phases,
        [
            vec![4, 5],
            vec![0, 1, 4, 5],
            vec![0, 1],
            vec![0, 1, 2, 3, 4, 5]
        ]
    );
    assert_eq!(switch.blocked_links(), []);
}

#[test]
fn test_switch_one_way_block_cuts_frames_in_flight_in_that_direction() {
    // Arrange: A->B and B->A on the wire when A -> B is blocked.
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    switch.submit(VirtNanos(0), A, frame(MAC_B, A, 1)).unwrap();
    switch.submit(VirtNanos(0), B, frame(MAC_A, B, 2)).unwrap();
    switch
        .schedule_fault(
            VirtNanos::from_micros(50),
            Fault::Block(links(&[A], &[B], false)),
        )
        .unwrap();

    // Act
    let schedule = drain(&mut switch);

    // Assert
    assert_eq!(schedule, [(MICROS_100, A, 2)]);
    assert_eq!(switch.counters(A).unwrap().dropped_partition, 1);
}

#[test]
fn test_switch_bridge_and_ring_are_scheduled_over_ports_in_order() {
    // Arrange: a bridge over C, A, B: C | B with A the bridge.
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    switch
        .schedule_fault(VirtNanos(0), Fault::Bridge(vec![C, A, B]))
        .unwrap();

    // Act
    all_links(&mut switch, VirtNanos(0), 0);
    let schedule = drain(&mut switch);
    let unknown = switch.schedule_fault(VirtNanos(0), Fault::MajoritiesRing(vec![A, PortId(9)]));

    // Assert: only B<->C (4, 5) cut.
    assert_eq!(delivered_links(&schedule, 0), [0, 1, 2, 3]);
    assert_eq!(unknown, Err(SwitchError::UnknownPort { port: PortId(9) }));
}

#[test]
fn test_switch_slow_port_delays_its_links_for_a_while() {
    // Arrange: A slow (5 ms) from 1 ms to 2 ms.
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    let ms = |n: u64| VirtNanos(n * 1_000_000);
    let slow = |latency| Fault::Slow { port: A, latency };
    switch
        .schedule_fault(ms(1), slow(Some(LatencyDist::Fixed(MS_5))))
        .unwrap();
    switch.schedule_fault(ms(2), slow(None)).unwrap();

    // Act: a frame on each link during the window and after it.
    all_links(&mut switch, ms(1), 0);
    let during = drain(&mut switch);
    all_links(&mut switch, ms(7), 10);
    let after = drain(&mut switch);

    // Assert: to and from A: 5 ms; B<->C: 100 us. After: 100 us for all.
    let delay = |schedule: &[(VirtNanos, PortId, u32)], tag: u32, sent: VirtNanos| {
        schedule
            .iter()
            .find(|&&(_, _, t)| t == tag)
            .map(|&(at, _, _)| at - sent)
    };
    for (tag, expected) in [(0, MS_5), (1, MS_5), (2, MS_5), (3, MS_5)] {
        assert_eq!(delay(&during, tag, ms(1)), Some(expected), "tag {tag}");
    }
    for tag in [4, 5] {
        assert_eq!(delay(&during, tag, ms(1)), Some(MICROS_100));
    }
    for tag in 10..16 {
        assert_eq!(delay(&after, tag, ms(7)), Some(MICROS_100));
    }
}

#[test]
fn test_switch_slow_port_changes_no_other_links_latencies() {
    // Arrange: random latencies; the same traffic with and without A slow.
    let base = jittery();
    let mut plain = switch_with(KEY, base);
    let mut slowed = switch_with(KEY, base);
    slowed
        .schedule_fault(
            VirtNanos(0),
            Fault::Slow {
                port: A,
                latency: Some(LatencyDist::Uniform {
                    min: MS_5,
                    max: VirtNanos(2 * MS_5.0),
                }),
            },
        )
        .unwrap();

    // Act
    let links = [(A, MAC_B), (B, MAC_C), (C, MAC_A)];
    let plain = spaced_delays(&mut plain, &links, 30);
    let slowed = spaced_delays(&mut slowed, &links, 30);

    // Assert: B->C frames (i % 3 == 1) took the same time in both runs;
    // frames to or from A took the slow latency.
    assert_eq!(plain.len(), 30);
    for (plain, slowed) in plain.iter().zip(&slowed) {
        if plain.0 % 3 == 1 {
            assert_eq!(plain, slowed);
        } else {
            assert!(
                (MS_5..=VirtNanos(2 * MS_5.0)).contains(&slowed.1),
                "{slowed:?}"
            );
        }
    }
}

#[test]
fn test_switch_loss_burst_drops_the_ports_frames_then_ends() {
    // Arrange: B loses everything from 0 to 1 ms.
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    let loss = |p: Option<f64>| Fault::Loss {
        port: B,
        loss: p.map(|p| Probability::new(p).unwrap()),
    };
    switch
        .schedule_fault(VirtNanos(0), loss(Some(1.0)))
        .unwrap();
    switch
        .schedule_fault(VirtNanos(1_000_000), loss(None))
        .unwrap();

    // Act
    all_links(&mut switch, VirtNanos(0), 0);
    let during = delivered_links(&drain(&mut switch), 0);
    all_links(&mut switch, VirtNanos(1_000_000), 10);
    let after = delivered_links(&drain(&mut switch), 10);

    // Assert: every link of B (0, 1, 4, 5) lost during the burst.
    assert_eq!(during, [2, 3]);
    assert_eq!(after, [0, 1, 2, 3, 4, 5]);
    assert_eq!(switch.counters(B).unwrap().dropped_loss, 2);
    assert_eq!(switch.counters(A).unwrap().dropped_loss, 1);
}

#[test]
fn test_switch_loss_burst_keeps_the_draws_of_later_frames() {
    // Arrange
    let base = jittery();
    let mut reliable = switch_with(KEY, base);
    let mut bursty = switch_with(KEY, base);
    let p = Probability::new(0.5).unwrap();
    bursty
        .schedule_fault(
            VirtNanos(0),
            Fault::Loss {
                port: B,
                loss: Some(p),
            },
        )
        .unwrap();
    bursty
        .schedule_fault(
            VirtNanos::from_secs(20),
            Fault::Loss {
                port: B,
                loss: None,
            },
        )
        .unwrap();

    // Act
    let reliable = spaced_delays(&mut reliable, &[(A, MAC_B)], 40);
    let bursty = spaced_delays(&mut bursty, &[(A, MAC_B)], 40);

    // Assert: some lost in the burst, none after it, survivors on time.
    assert!(bursty.iter().filter(|d| d.0 < 20).count() < 20);
    assert_eq!(bursty.iter().filter(|d| d.0 >= 20).count(), 20);
    assert!(bursty.iter().all(|d| reliable.contains(d)));
}

#[test]
fn test_switch_records_every_fate_without_changing_the_run() {
    // Arrange: lossy links, a cut with a frame in flight.
    let workload = |switch: &mut Switch| {
        switch
            .submit(VirtNanos(0), A, frame(MAC_B, A, 999))
            .unwrap();
        switch
            .schedule_fault(
                VirtNanos::from_micros(50),
                Fault::Block(links(&[A], &[B], true)),
            )
            .unwrap();
        all_links(switch, VirtNanos::from_micros(60), 1000);
        run_workload(switch)
    };
    let mut quiet = switch_with(KEY, lossy());
    let mut recording = switch_with(KEY, lossy());
    recording.record_frames(true);

    // Act
    let quiet_schedule = workload(&mut quiet);
    let recorded_schedule = workload(&mut recording);
    let events = recording.take_frame_events();

    // Assert
    assert_eq!(quiet_schedule, recorded_schedule);
    assert_eq!(quiet.save(), recording.save());
    assert!(quiet.take_frame_events().is_empty());
    let fate = |wanted: u32| {
        events
            .iter()
            .find(|e| tag(&e.frame) == wanted)
            .map(|e| (e.at, e.from, e.to, e.dropped))
    };
    assert_eq!(
        fate(999),
        Some((VirtNanos::from_micros(50), A, B, Some(DropReason::Blocked)))
    );
    assert_eq!(
        fate(1000),
        Some((VirtNanos::from_micros(60), A, B, Some(DropReason::Blocked)))
    );
    let delivered = events.iter().filter(|e| e.dropped.is_none()).count();
    assert_eq!(delivered, recorded_schedule.len());
    assert!(events.iter().any(|e| e.dropped == Some(DropReason::Loss)));
}

/// A switch with blocked links, overrides in force and the slow stream read.
fn faulty_switch() -> Switch {
    let mut switch = busy_switch();
    switch
        .schedule_fault(
            VirtNanos::from_micros(200),
            Fault::Block(links(&[A], &[C], false)),
        )
        .unwrap();
    switch
        .schedule_fault(
            VirtNanos::from_micros(200),
            Fault::Slow {
                port: B,
                latency: Some(LatencyDist::Uniform {
                    min: MICROS_100,
                    max: MS_5,
                }),
            },
        )
        .unwrap();
    switch
        .schedule_fault(
            VirtNanos::from_micros(200),
            Fault::Loss {
                port: C,
                loss: Some(Probability::new(0.25).unwrap()),
            },
        )
        .unwrap();
    switch
        .submit(VirtNanos::from_micros(250), B, frame(MAC_A, B, 99))
        .unwrap();
    switch
}

crate::persist::persist_round_trip_tests! {
    mod faulty_switch_persist {
        fresh: switch_with([0; 32], fixed(MICROS_100)),
        saved: faulty_switch(),
        mutate: |switch: &mut Switch| {
            switch.heal(VirtNanos::from_micros(300)).unwrap();
            drain(switch);
        },
    }
}

#[test]
fn test_switch_restored_mid_fault_continues_identically() {
    // Arrange
    let mut original = faulty_switch();
    let saved = original.save();
    assert!(!saved.blocked.is_empty() && saved.slow_word_pos > 0);
    assert!(!saved.port_latency.is_empty() && !saved.port_loss.is_empty());
    let mut restored =
        Switch::from_state(&serde_json::from_str(&serde_json::to_string(&saved).unwrap()).unwrap());

    // Act
    let original_schedule = run_workload(&mut original);
    let restored_schedule = run_workload(&mut restored);

    // Assert
    assert_eq!(original_schedule, restored_schedule);
    assert_eq!(original.save(), restored.save());
}

#[test]
fn test_switch_state_saved_with_a_partition_restores_its_blocked_links() {
    // Arrange: a state as saved before blocked links, a partition in force.
    let switch = switch_with(KEY, fixed(MICROS_100));
    let mut json: serde_json::Value = serde_json::to_value(switch.save()).unwrap();
    json["partition"] = serde_json::json!([[A], [B, C]]);

    // Act
    let state: SwitchState = serde_json::from_value(json).unwrap();
    let mut restored = Switch::from_state(&state);
    all_links(&mut restored, VirtNanos(0), 0);
    let schedule = drain(&mut restored);

    // Assert: A is cut off both ways; B <-> C (4, 5) up; saved the new way.
    assert_eq!(delivered_links(&schedule, 0), [4, 5]);
    assert_eq!(restored.blocked_links(), [(A, B), (A, C), (B, A), (C, A)]);
    assert_eq!(restored.save().partition, None);
}

/// A re-keyed switch draws its slow latencies from the new key's slow
/// stream, so the same switch saved and restored after the re-key (a branch
/// point a campaign returns to) draws exactly what the live one does. The
/// slow stream once kept the old key live while a restore derived it from
/// the new one: a reset and a straight run then disagreed.
#[test]
fn test_switch_rekey_renews_the_slow_stream_as_a_restore_does() {
    let slow_a = Fault::Slow {
        port: A,
        latency: Some(LatencyDist::Uniform {
            min: MS_5,
            max: VirtNanos(4 * MS_5.0),
        }),
    };
    let links = [(A, MAC_B), (B, MAC_A)];
    let mut live = switch_with(KEY, jittery());
    live.schedule_fault(VirtNanos(0), slow_a).unwrap();
    // Some slow draws under the first key, then the branch's re-key.
    spaced_delays(&mut live, &links, 6);
    live.rekey(OTHER_KEY);
    let mut restored = Switch::from_state(&live.save());
    let after_live = spaced_delays(&mut live, &links, 20);
    let after_restore = spaced_delays(&mut restored, &links, 20);
    assert_eq!(after_live, after_restore);
    // And a re-key with a new key changes the slow draws.
    let mut other = Switch::from_state(&restored.save());
    other.rekey(KEY);
    let mut same = Switch::from_state(&restored.save());
    same.rekey(OTHER_KEY);
    assert_ne!(
        spaced_delays(&mut other, &links, 20),
        spaced_delays(&mut same, &links, 20)
    );
}
